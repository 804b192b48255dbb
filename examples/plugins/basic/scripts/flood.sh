#!/bin/sh
# Writes without end.
yes "flood flood flood flood flood flood flood flood"
