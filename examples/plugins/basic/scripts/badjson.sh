#!/bin/sh
echo '{"status": "ok", broken'
