"""Composition of Experts: a model bundle's expert catalog and router, the job spec
and its requests, one socket's share of a deployed bundle, and the serving engine with
its report."""
