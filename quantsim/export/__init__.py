"""Deployable exports: standard QDQ, a fully integer model, and fixed-point requantization tables."""
