//! A headless Chromium driven over WebDriver (chromedriver on a free port,
//! a throwaway profile), for the browser tests. Screenshots go to
//! `target/browser-artifacts/`.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

pub struct Browser {
    pub client: Client,
    driver: Child,
    profile: std::path::PathBuf,
}

impl Browser {
    pub async fn start() -> Self {
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
    pub async fn wait_text(&self, id: &str, text: &str, within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // The page may replace the element between finding and reading
            // it (a stale reference): that is "not yet", not a failure.
            let found = match self.client.find(Locator::Id(id)).await {
                Ok(element) => element.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
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

    /// Clicks the element `css` selects.
    pub async fn click(&self, css: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .click()
            .await
            .unwrap();
    }

    /// Replaces the text of the input whose id is `id`.
    pub async fn fill(&self, id: &str, text: &str) {
        let input = self
            .client
            .find(Locator::Id(id))
            .await
            .unwrap_or_else(|e| panic!("#{id}: {e}"));
        input.clear().await.unwrap();
        input.send_keys(text).await.unwrap();
    }

    pub async fn screenshot(&self, name: &str) {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/browser-artifacts");
        std::fs::create_dir_all(&dir).unwrap();
        let png = self.client.screenshot().await.unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    pub async fn stop(self) {
        self.client.clone().close().await.ok();
        // Drop ends chromedriver and the browser.
    }
}

/// Also when a test panics: chromedriver and the browser it started (found by
/// its throwaway profile) must not outlive the test.
impl Drop for Browser {
    fn drop(&mut self) {
        self.driver.kill().ok();
        self.driver.wait().ok();
        Command::new("pkill")
            .arg("-f")
            .arg(self.profile.display().to_string())
            .status()
            .ok();
        std::fs::remove_dir_all(&self.profile).ok();
    }
}
