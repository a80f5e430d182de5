"""The control API (aiohttp): routes and body readers, the event feed, and who may call it."""
