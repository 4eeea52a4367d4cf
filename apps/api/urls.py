"""REST routes under /api/v1/."""

from rest_framework.routers import DefaultRouter

from apps.pipelines.api.stands import StandViewSet
from apps.pipelines.api.views import PipelineViewSet, RunViewSet
from apps.records.api.views import KindViewSet, OrphanViewSet, RecordViewSet

router = DefaultRouter()
router.register("records", RecordViewSet, basename="record")
router.register("kinds", KindViewSet, basename="kind")
router.register("orphans", OrphanViewSet, basename="orphan")
router.register("pipelines", PipelineViewSet, basename="pipeline")
router.register("runs", RunViewSet, basename="run")
router.register("stands", StandViewSet, basename="stand")

urlpatterns = router.urls
