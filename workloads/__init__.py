"""Locust user classes, the streaming OpenAI client, prompt generation and load shapes."""
