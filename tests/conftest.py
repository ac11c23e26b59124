pytest_plugins = ["tests.lab_fixtures", "tests.kube.conftest_plugin"]
