"""Kafka access shared by every runner and command: the one admin (``admin``: group
offsets, commit notes, watermarks, offsets for a time, altering offsets), positions and
their resolution to offsets (``positions``) and Kafka's murmur2 partitioner
(``partitioner``). Importing the package imports none of them.
"""
