"""pyinfra facts and operations of the MI210 provisioning deploy.

They stay thin: each reads host state through a fact or takes it from the probe, asks the core package (cdna2/)
what to do, and yields quoted commands, or calls host.noop() and returns when the host already matches.
"""
