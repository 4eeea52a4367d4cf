"""REST routes under /api/v1/."""

from django.urls import path
from rest_framework.routers import APIRootView, DefaultRouter

from apps.accounts.api.views import OwnTokenViewSet, ServiceAccountViewSet
from apps.agents.api.views import AgentViewSet
from apps.api.access_views import BindingViewSet, NamespaceViewSet, RoleViewSet
from apps.api.audit_views import AuditViewSet
from apps.api.views import WhoAmI
from apps.artifacts.api.views import ArtifactViewSet
from apps.pipelines.api.revisions import RevisionViewSet
from apps.pipelines.api.sources import SourceViewSet
from apps.pipelines.api.stands import StandViewSet
from apps.pipelines.api.triggers import TriggerViewSet
from apps.pipelines.api.views import PipelineViewSet, RunViewSet
from apps.records.api.views import KindViewSet, OrphanViewSet, RecordViewSet
from apps.secrets.api.views import SecretViewSet


class ApiRoot(APIRootView):
    """The links to every list of the API."""

    access_public = True  # a map of the API, the same for every signed-in caller


router = DefaultRouter()
router.APIRootView = ApiRoot
router.register("records", RecordViewSet, basename="record")
router.register("kinds", KindViewSet, basename="kind")
router.register("orphans", OrphanViewSet, basename="orphan")
router.register("pipelines", PipelineViewSet, basename="pipeline")
router.register("runs", RunViewSet, basename="run")
router.register("revisions", RevisionViewSet, basename="revision")
router.register("sources", SourceViewSet, basename="source")
router.register("stands", StandViewSet, basename="stand")
router.register("triggers", TriggerViewSet, basename="trigger")
router.register("agents", AgentViewSet, basename="agent")
router.register("secrets", SecretViewSet, basename="secret")
router.register("artifacts", ArtifactViewSet, basename="artifact")
router.register("namespaces", NamespaceViewSet, basename="namespace")
router.register("roles", RoleViewSet, basename="role")
router.register("rolebindings", BindingViewSet, basename="rolebinding")
router.register("accounts", ServiceAccountViewSet, basename="account")
router.register("tokens", OwnTokenViewSet, basename="token")
router.register("audit", AuditViewSet, basename="audit")

urlpatterns = [path("whoami/", WhoAmI.as_view(), name="whoami"), *router.urls]
