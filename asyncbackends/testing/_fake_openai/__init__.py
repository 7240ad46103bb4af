"""The parts of the OpenAI Batch API look-alike (`asyncbackends.testing.fake_openai_batches`)."""
