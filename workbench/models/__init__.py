"""Built-in model families. Importing this package registers them."""

from workbench.models import activations, efficientzero, ilql, mlp, query, toy_language

__all__ = ["activations", "efficientzero", "ilql", "mlp", "query", "toy_language"]
