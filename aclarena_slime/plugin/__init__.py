"""The plugin API: everything an environment plugin's author imports, in one package.

- :mod:`.contract`: :class:`~.contract.Environment`, :class:`~.contract.Episode` and the values they
  exchange (``Task``, ``Conversation``, ``Observation``, ``Done``, ``Score``, ``EpisodeAborted``);
- :mod:`.registry`: envs by tag, from the entry-point group ``aclarena_slime.envs``;
- :mod:`.conformance`: ``check_environment`` and ``check_hostile_outputs``, the kit a plugin's tests run;
- :mod:`.hostile`: the known-bad model turns the kit replays;
- :mod:`.settings`: ``from_mapping``, settings dataclasses that refuse misspelt keys.

The pytest fixtures for plugin tests come with the package as a pytest plugin
(:mod:`aclarena_slime.testing.pytest_plugin`, entry point ``pytest11``). Import from the modules
(``from aclarena_slime.plugin.contract import Environment``): one path for each name.
"""
