"""The reports of a run, written as JSON (every host, every field) and as Markdown a person reads at 1 host and at
1,000: ``run`` for the deploy, verify, rollback and bench runs, ``bench`` for the figures and their picture,
``hostlist`` and ``groups`` for naming many hosts briefly and telling the ones that differ from the rest."""
