"""Settings are split by purpose: base (shared), dev (embedded default), test, prod."""
