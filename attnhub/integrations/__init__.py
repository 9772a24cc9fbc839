"""Integrations of attnhub with other libraries, each loaded only when imported by name.

``import attnhub`` imports none of them (and so no framework): ``attnhub.integrations.transformers``
imports torch and Hugging Face transformers when the user imports it.
"""
