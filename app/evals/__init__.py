"""Long-context evaluations: passkey retrieval and perplexity, full attention vs InfLLM."""
