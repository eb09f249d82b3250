"""Job backends: one small protocol (`base.Backend`), one module per backend."""
