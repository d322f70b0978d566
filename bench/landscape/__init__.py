"""Landscapes: record a study's whole route space with a real backend, and answer routes from it in-process."""
