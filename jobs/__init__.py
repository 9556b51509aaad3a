"""Inputs, jobs and their lifecycle, results, webhooks, and the batch API (/batch/v1)."""
