"""Built-in adapters, each imported only when `create_backend` builds it."""
