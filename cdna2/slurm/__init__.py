"""Slurm as the way to the nodes (no pyinfra here; connectors/slurm.py is the pyinfra side):

- ``allocation``: the nodes of the current allocation and the host data they share (inventory/slurm.py);
- ``steps``: the ``srun`` command lines of a job step on one node and of one step across many, and telling
  Slurm's own refusals ("Unable to create step", a node down, the allocation ended) from the command's exit;
- ``fanout``: one job step that runs each node's command on every node at once, each node's output and exit
  status framed so the controller hands each host its own result.
"""
