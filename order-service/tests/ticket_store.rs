//! The ticket store against a real S3-compatible server (s3s-fs, which
//! keeps each bucket as a folder and each object as a file), not a mock:
//! a worker and an order service, each with its own store built from the
//! same `s3://bucket/prefix` URL, share the PDFs as two replicas would.
//!
//! Needs the `s3s-fs` binary: `bash -c '. scripts/lib.sh; ensure_s3s_fs'`
//! installs it (scripts/test.sh does).

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::{internal_client, redis_url, SERVICE_TOKEN, TICKET_SECRET};
use object_store::aws::AmazonS3Builder;
use order_service::tickets::TicketStore;
use sqlx::PgPool;
use uuid::Uuid;

const ACCESS_KEY: &str = "boxoffice-test-access";
const SECRET_KEY: &str = "boxoffice-test-secret-key";
const REGION: &str = "us-east-1";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `s3s-fs` on the PATH or in ~/.cargo/bin; a missing one fails the test.
fn s3s_fs_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    let cargo_bin = std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo/bin"));
    on_path
        .into_iter()
        .chain(cargo_bin)
        .map(|dir| dir.join("s3s-fs"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "the S3-compatible test server s3s-fs is not installed; run \
                 `bash -c '. scripts/lib.sh; ensure_s3s_fs'` (scripts/test.sh does)"
            )
        })
}

/// An s3s-fs server on a free port over a temporary folder, killed on drop.
struct S3Server {
    child: Child,
    root: PathBuf,
    endpoint: String,
}

impl S3Server {
    async fn start() -> Self {
        let binary = s3s_fs_binary();
        let root = std::env::temp_dir().join(format!("boxoffice-s3s-{}", Uuid::now_v7()));
        std::fs::create_dir_all(&root).unwrap();
        let port = free_port();
        let child = Command::new(binary)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(&root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting s3s-fs");
        let server = Self {
            child,
            root,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return server;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("s3s-fs did not listen on port {port}");
    }

    /// A bucket is a folder in s3s-fs's root.
    fn bucket(&self, name: &str) -> String {
        std::fs::create_dir_all(self.root.join(name)).unwrap();
        name.to_owned()
    }

    /// What a replica is given besides the URL (the `AWS_*` settings).
    fn settings(&self) -> AmazonS3Builder {
        AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_region(REGION)
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .with_allow_http(true)
    }

    /// The same settings as the standard environment variables.
    fn env(&self) -> [(&'static str, String); 5] {
        [
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            ("AWS_REGION", REGION.into()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
        std::fs::remove_dir_all(&self.root).ok();
    }
}

fn fake_pdf(order: Uuid) -> Vec<u8> {
    format!("%PDF-1.7\n% tickets of order {order}\n%%EOF\n").into_bytes()
}

#[tokio::test]
async fn two_replicas_share_ticket_pdfs_through_an_s3_bucket() {
    let s3 = S3Server::start().await;
    let bucket = s3.bucket("tickets");
    let url = format!("s3://{bucket}/some/prefix");
    let worker = TicketStore::open(&url, s3.settings()).unwrap();
    let order_service = TicketStore::open(&url, s3.settings()).unwrap();

    let order = Uuid::now_v7();
    let pdf = fake_pdf(order);
    worker.put(order, pdf.clone()).await.unwrap();
    assert_eq!(order_service.get(order).await.unwrap(), Some(pdf.clone()));

    // The object is where the URL says: under the prefix in the bucket.
    let on_disk = s3
        .root
        .join(format!("{bucket}/some/prefix/orders/{order}.pdf"));
    assert_eq!(std::fs::read(&on_disk).unwrap(), pdf);

    assert_eq!(order_service.get(Uuid::now_v7()).await.unwrap(), None);

    // Wrong credentials are an error, not "not issued yet".
    let stranger = TicketStore::open(
        &url,
        s3.settings().with_secret_access_key("not-the-secret-key"),
    )
    .unwrap();
    assert!(stranger.get(order).await.is_err());
}

/// The real `order-service serve`, given the URL and the standard `AWS_*`
/// variables, serves the PDF a worker put in the bucket.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn the_order_service_serves_the_pdf_a_worker_put_in_s3(pool: PgPool) {
    let s3 = S3Server::start().await;
    let bucket = s3.bucket("shared");
    let url = format!("s3://{bucket}/boxoffice");
    let order = Uuid::now_v7();
    let pdf = fake_pdf(order);
    let worker = TicketStore::open(&url, s3.settings()).unwrap();
    worker.put(order, pdf.clone()).await.unwrap();
    let on_disk = s3
        .root
        .join(format!("{bucket}/boxoffice/orders/{order}.pdf"));
    assert_eq!(
        std::fs::read(&on_disk).unwrap(),
        pdf,
        "the PDF is in the bucket"
    );

    let port = free_port();
    let prefix = format!("t{}", Uuid::new_v4().simple());
    let mut command = Command::new(env!("CARGO_BIN_EXE_order-service"));
    command
        .arg("serve")
        .env_clear()
        .env("RUST_LOG", "warn")
        .env("ORDER_SERVICE_LISTEN", format!("127.0.0.1:{port}"))
        .env("DATABASE_URL", common::database_url(&pool).await)
        .env("REDIS_URL", redis_url())
        .env("KAFKA_BROKERS", common::brokers())
        .env("BOXOFFICE_REDIS_PREFIX", &prefix)
        .env("BOXOFFICE_RELAY", "false")
        .env("BOXOFFICE_SERVICE_TOKEN", SERVICE_TOKEN)
        .env("PAYMENT_API_KEY", SERVICE_TOKEN)
        .env("BOXOFFICE_ALLOW_DEV_SECRETS", "true")
        .env("BOXOFFICE_TICKET_STORE", &url)
        .envs(s3.env())
        .stdout(Stdio::null());
    let mut child = command.spawn().expect("spawning order-service");
    let base = format!("http://127.0.0.1:{port}");
    let http = internal_client();
    let mut up = false;
    for _ in 0..300 {
        if let Ok(response) = http.get(format!("{base}/healthz")).send().await {
            up = response.status().is_success();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if !up {
        child.kill().ok();
        child.wait().ok();
        panic!("order-service did not come up on port {port}");
    }

    let got = http
        .get(format!("{base}/internal/orders/{order}/tickets.pdf"))
        .send()
        .await
        .unwrap();
    let not_issued = http
        .get(format!(
            "{base}/internal/orders/{}/tickets.pdf",
            Uuid::now_v7()
        ))
        .send()
        .await
        .unwrap();
    child.kill().ok();
    child.wait().ok();
    assert_eq!(got.status(), 200);
    assert_eq!(got.headers()["content-type"], "application/pdf");
    assert_eq!(got.bytes().await.unwrap().to_vec(), pdf);
    assert_eq!(not_issued.status(), 404);
}

fn order_service(args: &[&str], store: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_order-service"))
        .args(args)
        .env_clear()
        .env("RUST_LOG", "warn")
        .env("BOXOFFICE_TICKET_STORE", store)
        .env("BOXOFFICE_TICKET_SECRET", TICKET_SECRET)
        .env("BOXOFFICE_SERVICE_TOKEN", SERVICE_TOKEN)
        .env("PAYMENT_API_KEY", SERVICE_TOKEN)
        .env("BOXOFFICE_ALLOW_DEV_SECRETS", "true")
        // Nothing answers here: a bad store must be refused before any connection.
        .env("DATABASE_URL", "postgres://postgres@127.0.0.1:1/none")
        .output()
        .unwrap()
}

#[test]
fn a_bad_ticket_store_url_stops_both_binaries_at_start_naming_the_setting() {
    for store in ["ftp://host/tickets", "s3://", "gs://bucket/prefix"] {
        for command in [
            &["serve", "--listen", "127.0.0.1:0"][..],
            &["worker", "--listen", "127.0.0.1:0"][..],
        ] {
            let out = order_service(command, store);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{command:?} {store:?}: {stderr}");
            assert!(
                stderr.contains("BOXOFFICE_TICKET_STORE") && stderr.contains(store),
                "{command:?} {store:?}: {stderr}"
            );
            assert!(!stderr.contains("panicked"), "{stderr}");
            assert!(!stderr.contains("connecting to Postgres"), "{stderr}");
        }
    }
}
