"""Tests of the pure NetworkPolicy compiler (policy/)."""
