"""The Studio's pages. Views read through the apps' selectors and act through their services,
with the same permission checks as the API; they never write to the ORM themselves."""
