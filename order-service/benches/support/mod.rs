//! A throwaway Postgres database for one benchmark run, migrated with the
//! order service's migrations and dropped at the end. Shared by the order
//! service's benches and the gateway's purchase bench (by `#[path]`).
#![allow(dead_code)]

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgConnection};

pub struct BenchDb {
    admin: PgConnection,
    name: String,
    /// Options that connect to the new database.
    pub connect: PgConnectOptions,
    /// The same, as a URL (for tools such as pgbench).
    pub url: String,
}

impl BenchDb {
    /// Creates and migrates a database next to `DATABASE_URL`'s.
    pub async fn create() -> Self {
        let admin: PgConnectOptions = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
            .parse()
            .unwrap();
        let name = format!("bench_{}", uuid::Uuid::new_v4().simple());
        let mut admin_conn = admin.connect().await.unwrap();
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut admin_conn)
            .await
            .unwrap();
        let connect = admin.clone().database(&name);
        let migrate = PgPoolOptions::new()
            .connect_with(connect.clone())
            .await
            .unwrap();
        order_service::MIGRATOR.run(&migrate).await.unwrap();
        migrate.close().await;
        let url = format!(
            "postgres://{}@{}:{}/{name}",
            admin.get_username(),
            admin.get_host(),
            admin.get_port()
        );
        Self {
            admin: admin_conn,
            name,
            connect,
            url,
        }
    }

    /// Drops the database (closing whatever still holds it).
    pub async fn drop(mut self) {
        sqlx::query(&format!("DROP DATABASE {} WITH (FORCE)", self.name))
            .execute(&mut self.admin)
            .await
            .unwrap();
        self.admin.close().await.unwrap();
    }
}
