"""The differential suite: each module checks one behaviour against the reference system itself.

One module per reference: a real ``vllm serve`` (prompt ids, tool calls, reasoning split), lm-eval's and
lighteval's own models (scoring, generation), and the specs (SSE, the OpenAI Batch API) as property tests.
A reference built by copying the library's own logic into a test is not a reference.
"""
