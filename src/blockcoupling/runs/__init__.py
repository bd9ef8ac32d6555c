"""How runs are made and read, whatever they measure: the machinery every collection kind and
every study stands on, naming none of them (``blockcoupling.studies`` stands on it).

- ``protocol``: the run protocol of every collection kind (`run_collection`): open, lock,
  record, verify, resume, rebuild; ``store.folder`` is its first step, shared with
  ``measure`` and ``perturb``;
- ``kinds``: the registry of collection kinds (``CollectionKind``, ``register``);
- ``read``: ``open_collection`` -> ``Sweep``, the one reader of every kind;
- ``collection``: dispatch by kind (the page, ``collection upgrade``, a spec's kind);
- ``executor``: ``run_each``, the one task loop (ray | local), and the Ray connection;
- ``integrity``: whether a done unit can be trusted, and the line that repairs it;
- ``identity``: the content of local inputs as part of an identity;
- ``plans``: ``RunPlan`` / ``StudyPlan``, what every ``--dry-run`` plan is made of;
- ``statistic``: ``coupling_statistic``, the headline statistic on any source.

The public names (``open_collection``, ``Sweep``, ``coupling_statistic``) are exported by
``blockcoupling``; the format of a collection on disk is ``blockcoupling.store.collection``.
"""
