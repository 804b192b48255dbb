#!/bin/sh
echo "partial output"
echo "disk quota exceeded while writing /tmp/x" >&2
exit 3
