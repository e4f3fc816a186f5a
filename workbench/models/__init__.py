"""Built-in model families. Importing this package registers them."""

from workbench.models import activations, efficientzero, mlp, query

__all__ = ["activations", "efficientzero", "mlp", "query"]
