"""The anex project: settings, URLs and the API plumbing every app uses."""
