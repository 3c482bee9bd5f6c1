"""Text in and out: the GGUF tokenizer and its vocabularies, sandboxed chat templates, prompt inputs, the chat
loop with its stop strings and streamed text."""
