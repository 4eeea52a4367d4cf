from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "apps.accounts"
    label = "accounts"
    verbose_name = "Accounts and API tokens"

    def ready(self) -> None:
        # drf-spectacular finds an authentication class's scheme by an extension class, which
        # registers itself when its module is imported.
        from apps.accounts import authentication  # noqa: F401
