"""The user-facing layer: `compile()`, CompiledModel, and the `dnnc` command."""
