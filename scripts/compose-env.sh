#!/usr/bin/env bash
# Writes .env with random secrets for `docker compose up` (compose.yaml has no
# defaults that work). Keeps an existing .env.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f .env ] && { echo ".env exists; keeping it"; exit 0; }
umask 077
{
  for name in BOXOFFICE_SERVICE_TOKEN BOXOFFICE_QUEUE_SECRET BOXOFFICE_TICKET_SECRET BOXOFFICE_ADMIN_TOKEN PAYMENT_API_KEY; do
    echo "$name=$(openssl rand -hex 32)"
  done
} >.env
echo "wrote .env (random secrets; keep it out of git)"
