"""Pins: resolve them (Hub, sources, bases), write and read matrix.lock.json."""
