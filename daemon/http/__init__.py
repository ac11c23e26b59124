"""HTTP intake: the aiohttp app and Alertmanager payload parsing."""
