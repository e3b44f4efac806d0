"""Anthropic's Messages API: wire models, translation to the chat template, and the event encoder."""
