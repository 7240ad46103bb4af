"""The TGI look-alike's parts: its model, validation, responses, faults, images and command line.

Users start the server from `asyncbackends.testing.fake_tgi` (`FakeTGIServer`, `Limits`).
"""
