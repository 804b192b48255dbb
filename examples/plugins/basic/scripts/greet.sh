#!/bin/sh
# Reads the parameters object from stdin and answers in plain text.
read -r input
echo "hello from sh, got: $input"
