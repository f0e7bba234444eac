"""``luminal serve``: an OpenAI-compatible HTTP server over luminal's compiled plans.

``app.create_app`` builds the FastAPI application (chat completions, completions,
embeddings, models, health, Prometheus metrics); ``engine.LLMEngine`` runs continuous
batching over one batched decode plan (``batched.BatchedDecoder``) and unloads the model
after an idle period; ``cli`` is the command line. See docs/serving.md.
"""
