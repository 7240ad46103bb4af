"""What every HTTP adapter (``tgi``, ``openai``, ``endpoints``) shares.

`transport` (one aiohttp session on the shared loop, status and error mapping), `streams` (server-sent
events), `credentials` (secrets held masked) and `health_watch` (an idle limit kept by a server's
``GET /health`` while a whole answer is awaited).
"""
