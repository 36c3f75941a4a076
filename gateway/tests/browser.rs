//! The fan page in a real browser (Debian's headless Chromium, driven over
//! WebDriver by chromedriver) against a whole running stack: a fan joins an
//! event that demands proof of work, the page solves it, waits its turn,
//! buys and sees the order confirmed with its tickets. Screenshots go to
//! `target/browser-artifacts/`.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Stack, ADMIN_TOKEN};
use fantoccini::{Client, ClientBuilder, Locator};
use reqwest::StatusCode;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

struct Browser {
    client: Client,
    driver: Child,
    profile: std::path::PathBuf,
}

impl Browser {
    async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "chromedriver (apt-get install chromium chromium-driver; scripts/test.sh does)",
            );
        let profile =
            std::env::temp_dir().join(format!("boxoffice-chromium-{}", uuid::Uuid::new_v4()));
        let capabilities = json!({
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--window-size=1000,900",
                    format!("--user-data-dir={}", profile.display()),
                ]
            }
        });
        let capabilities = capabilities.as_object().unwrap().clone();
        let mut last_error = None;
        for _ in 0..50 {
            match ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(capabilities.clone())
                .connect(&format!("http://127.0.0.1:{port}"))
                .await
            {
                Ok(client) => {
                    return Self {
                        client,
                        driver,
                        profile,
                    }
                }
                Err(error) => last_error = Some(error),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no WebDriver session: {last_error:?}");
    }

    /// Waits until the element's text contains `text`; returns the text.
    async fn wait_text(&self, id: &str, text: &str, within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let found = self
                .client
                .find(Locator::Id(id))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            if found.contains(text) {
                return found;
            }
            if tokio::time::Instant::now() > deadline {
                self.screenshot("timeout").await;
                panic!("#{id} never said {text:?}; it says {found:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn screenshot(&self, name: &str) {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/browser-artifacts");
        std::fs::create_dir_all(&dir).unwrap();
        let png = self.client.screenshot().await.unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    async fn stop(mut self) {
        self.client.close().await.ok();
        self.driver.kill().ok();
        self.driver.wait().ok();
        std::fs::remove_dir_all(&self.profile).ok();
    }
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn a_fan_proves_work_joins_waits_buys_and_gets_tickets_in_a_browser(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start(pool_options, connect).await;
    stack.create_event("ev", 100, 20.0, 4).await;
    let response = stack
        .http
        .patch(format!("{}/admin/v1/events/ev", stack.admission))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "pow_bits": 12 }))
        .send()
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "{:?}",
        response.text().await
    );
    // The event really demands the work: a join without it is refused.
    let (status, body) = stack.join("ev", "no-work").await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{body}");

    let browser = Browser::start().await;
    let page = &browser.client;
    page.goto(&format!("{}/?event=ev", stack.gateway))
        .await
        .unwrap();
    browser
        .wait_text("name", "Test ev", Duration::from_secs(10))
        .await;
    let fan = page.find(Locator::Id("fan")).await.unwrap();
    fan.clear().await.unwrap();
    fan.send_keys("browser-fan").await.unwrap();
    browser.screenshot("1-event").await;
    page.find(Locator::Id("join"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();

    // The page solves the challenge, joins, waits and is admitted.
    browser
        .wait_text("status", "Choose your tickets", Duration::from_secs(60))
        .await;
    browser.screenshot("2-admitted").await;

    page.find(Locator::Id("quantity"))
        .await
        .unwrap()
        .select_by_index(1)
        .await
        .unwrap();
    page.find(Locator::Id("buy"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .wait_text("tickets", "2 ticket(s) issued", Duration::from_secs(90))
        .await;
    let status = browser
        .wait_text("order-status", "confirmed", Duration::from_secs(5))
        .await;
    assert!(status.contains("tickets ready"), "{status}");
    browser.screenshot("3-confirmed").await;
    // The page offers the PDF and fetches it with the order token.
    page.find(Locator::Id("download"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    browser
        .wait_text("status", "Tickets downloaded", Duration::from_secs(10))
        .await;

    // What the page showed is what the server holds.
    let (fan_id, quantity, state): (String, i32, String) =
        sqlx::query_as("SELECT fan_id, quantity, status FROM orders")
            .fetch_one(&stack.pool)
            .await
            .unwrap();
    assert_eq!(
        (fan_id.as_str(), quantity, state.as_str()),
        ("browser-fan", 2, "confirmed")
    );

    browser.stop().await;
    stack.stop().await;
}
