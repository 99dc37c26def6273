pytest_plugins = ["aclarena_slime.testing.pytest_plugin"]
