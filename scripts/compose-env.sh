#!/usr/bin/env bash
# Writes the secrets compose.yaml needs, random, into .env (or FILE) for
# `docker compose up`: compose.yaml has no defaults and no secret in it
# (every one is ${NAME:?run scripts/compose-env.sh first}). Keeps the values
# an existing file has and adds only the ones it lacks, so it is safe to run
# again after compose.yaml gains a secret.
#   scripts/compose-env.sh [FILE]
# scripts/check_compose.py reads SECRETS below (the names this writes) and
# checks them against compose.yaml's ${NAME:?…}.
set -euo pipefail
cd "$(dirname "$0")/.."
file=${1:-.env}
SECRETS="BOXOFFICE_SERVICE_TOKEN BOXOFFICE_QUEUE_SECRET BOXOFFICE_TICKET_SECRET BOXOFFICE_ADMIN_TOKEN PAYMENT_API_KEY POSTGRES_PASSWORD S3_ACCESS_KEY S3_SECRET_KEY"
umask 077
touch "$file"
added=0
for name in $SECRETS; do
  grep -q "^$name=" "$file" && continue
  echo "$name=$(openssl rand -hex 32)" >>"$file"
  added=$((added + 1))
done
echo "$file: $added secret(s) added (random; keep the file out of git)"
