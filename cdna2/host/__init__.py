"""Code that runs on the provisioned hosts: standard library only.

The deploy ships these modules to each host (the probe's inline in one SSH command, cdna2/probe_payload.py; all of
them as files in the agent), where the target Python environment may hold nothing but AITER. A unit test rejects
any import outside the standard library.
"""
