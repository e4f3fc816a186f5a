"""Built-in model families. Importing this package registers them."""

from workbench.models import activations, mlp

__all__ = ["activations", "mlp"]
