"""Code that runs on the provisioned hosts: standard library only.

The deploy ships these modules to each host (the probe inline in one SSH command, the others as files), where the
target Python environment may hold nothing but AITER. A unit test rejects any import outside the standard library.
"""
