#!/usr/bin/env bash
# Run by the postgres image once, when its data volume is first initialised (files in
# /docker-entrypoint-initdb.d; compose.yaml mounts this folder there). Creates the
# SELECT-only login Grafana's finance dashboard uses, including on the ledger tables
# the gateway creates later (default privileges of the owning role).
# With an existing volume it does not run: create the role by hand, or drop the volume.
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  --set reader_password="${GRAFANA_DB_PASSWORD:-grafana}" \
  --set owner="$POSTGRES_USER" \
  --set dbname="$POSTGRES_DB" <<'EOSQL'
CREATE ROLE grafana_reader LOGIN PASSWORD :'reader_password';
GRANT CONNECT ON DATABASE :"dbname" TO grafana_reader;
GRANT USAGE ON SCHEMA public TO grafana_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA public TO grafana_reader;
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public GRANT SELECT ON TABLES TO grafana_reader;
EOSQL
