pytest_plugins = ["tests.lab_fixtures"]
