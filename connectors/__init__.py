"""pyinfra connectors of this tool (pyinfra's entry point group ``pyinfra.connectors``, declared in pyproject.toml):
``@slurm/NODE`` (connectors/slurm.py)."""
