//! The stores' credentials and TLS are configuration: a `rediss://` URL with
//! an ACL user reaches a real TLS-only `redis-server`, and a `DATABASE_URL`
//! with `sslmode=require` gets an encrypted PostgreSQL session.

use std::process::{Command, Stdio};
use std::time::Duration;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A self-signed certificate for 127.0.0.1 in a directory of its own.
fn certificate() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("boxoffice-tls-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let status = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    dir
}

#[tokio::test]
async fn a_rediss_url_with_an_acl_user_reaches_a_tls_only_redis() {
    let (dir, port) = (certificate(), free_port());
    let mut server = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--tls-port", &port.to_string(), "--tls-auth-clients", "no"])
        .arg("--tls-cert-file")
        .arg(dir.join("cert.pem"))
        .arg("--tls-key-file")
        .arg(dir.join("key.pem"))
        // An ACL user of BoxOffice's own; the default user is off.
        .args([
            "--user",
            "default",
            "off",
            "--user",
            "boxoffice",
            "on",
            ">s3cret-pw",
            "~*",
            "+@all",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server on PATH");
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // `#insecure`: the test's certificate is self-signed (a private CA is
    // trusted with SSL_CERT_FILE instead).
    let url = format!("rediss://boxoffice:s3cret-pw@127.0.0.1:{port}/#insecure");
    let mut redis = boxoffice_contract::redis_link::connect(&url).await.unwrap();
    let who: String = redis::cmd("ACL")
        .arg("WHOAMI")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(who, "boxoffice");

    let wrong = format!("rediss://boxoffice:wrong@127.0.0.1:{port}/#insecure");
    let refused = match boxoffice_contract::redis_link::connect(&wrong).await {
        Ok(mut redis) => redis::cmd("PING")
            .query_async::<String>(&mut redis)
            .await
            .is_err(),
        Err(_) => true,
    };
    assert!(refused, "a wrong password is refused");
    let plain = format!("redis://boxoffice:s3cret-pw@127.0.0.1:{port}");
    let cleartext = match boxoffice_contract::redis_link::connect(&plain).await {
        Ok(mut redis) => redis::cmd("PING")
            .query_async::<String>(&mut redis)
            .await
            .is_ok(),
        Err(_) => false,
    };
    assert!(!cleartext, "the server speaks TLS only");
    server.kill().ok();
    server.wait().ok();
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_database_url_with_sslmode_require_is_encrypted(pool: sqlx::PgPool) {
    let name: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let (server, _) = base.rsplit_once('/').unwrap();
    let url = format!("{server}/{name}?sslmode=require");
    let tls = order_service::connect_db(&url, 1).await.unwrap();
    let (ssl, version): (bool, Option<String>) =
        sqlx::query_as("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&tls)
            .await
            .unwrap();
    assert!(ssl, "the session is encrypted");
    assert!(version.is_some_and(|v| v.starts_with("TLS")));
}
