//! The fan page in a real browser (Debian's headless Chromium, driven over
//! WebDriver by chromedriver) against a whole running stack: a fan joins an
//! event that demands proof of work, the page solves it, waits its turn,
//! buys and sees the order confirmed with its tickets. Screenshots go to
//! `target/browser-artifacts/`.

mod common;

use std::time::Duration;

use common::browser::Browser;
use common::{Stack, ADMIN_TOKEN};
use fantoccini::key::Key;
use fantoccini::Locator;
use reqwest::StatusCode;
use serde_json::json;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

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
    browser.fill("fan", "browser-fan").await;
    browser.screenshot("1-event").await;
    browser.click("#join").await;

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
    browser.click("#buy").await;
    browser
        .wait_text("tickets", "2 ticket(s) issued", Duration::from_secs(90))
        .await;
    let status = browser
        .wait_text("order-status", "confirmed", Duration::from_secs(5))
        .await;
    assert!(status.contains("tickets ready"), "{status}");
    browser.screenshot("3-confirmed").await;
    // The page offers the PDF and fetches it with the order token.
    browser.click("#download").await;
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

/// Runs `script` (which must `return` a value) in the page until `done` holds.
async fn wait_js(
    browser: &Browser,
    script: &str,
    done: impl Fn(&serde_json::Value) -> bool,
    within: Duration,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let value = browser.client.execute(script, vec![]).await.unwrap();
        if done(&value) {
            return value;
        }
        if tokio::time::Instant::now() > deadline {
            browser.screenshot("dashboard-timeout").await;
            panic!("{script} never held; last {value}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn admin_view(stack: &Stack, event_id: &str) -> serde_json::Value {
    stack
        .admin_get(&format!("/admin/v1/events/{event_id}"))
        .await
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn the_ops_dashboard_charts_live_figures_and_its_controls_reach_the_admin_api(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start(pool_options, connect).await;
    stack.create_event("ev", 100, 20.0, 4).await;
    // Live figures to chart: a fan who bought 3 seats, two still in line... or admitted.
    let (_, joined) = stack.join("ev", "buyer").await;
    let access = stack
        .wait_admitted("ev", joined["queue_ticket"].as_str().unwrap())
        .await;
    let (status, bought) = stack.buy("ev", &access, 3, Some("k")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{bought}");
    stack
        .wait_ticketed(
            bought["order_id"].as_str().unwrap(),
            bought["order_token"].as_str().unwrap(),
        )
        .await;
    for fan in ["f1", "f2"] {
        stack.join("ev", fan).await;
    }

    let browser = Browser::start().await;
    let page = &browser.client;
    page.goto(&format!("{}/admin/", stack.admission))
        .await
        .unwrap();
    // A wrong token is refused and says so.
    browser.fill("token", "not-the-token").await;
    browser.click("#login button").await;
    browser
        .wait_text("status", "token was refused", Duration::from_secs(10))
        .await;
    browser.fill("token", ADMIN_TOKEN).await;
    browser.click("#login button").await;

    // Seven charts, each drawn (a canvas) with several samples of live data.
    let charts = wait_js(
        &browser,
        "return [...document.querySelectorAll('#charts .chart')].map(c => \
           [c.id, Number(c.dataset.points), c.querySelectorAll('canvas').length])",
        |v| {
            v.as_array().is_some_and(|charts| {
                charts.len() == 7 && charts.iter().all(|c| c[1].as_u64() >= Some(4))
            })
        },
        Duration::from_secs(30),
    )
    .await;
    for chart in charts.as_array().unwrap() {
        assert!(chart[2].as_u64() >= Some(1), "{chart} has no canvas");
    }
    // The tiles show the live figures the admin API reports.
    browser
        .wait_text("tile-sold", "3", Duration::from_secs(10))
        .await;
    browser
        .wait_text("tile-confirmed", "1", Duration::from_secs(10))
        .await;
    // The charted series hold the same figures (uPlot's data, newest point).
    let sold = page
        .execute(
            "const c = document.getElementById('chart-seats'); \
             return Number(c.dataset.points) > 0 && document.querySelector('#tile-remaining .value').textContent",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(sold, "97");
    browser.screenshot("dashboard-1-live").await;
    page.execute("document.getElementById('charts').scrollIntoView()", vec![])
        .await
        .unwrap();
    browser.screenshot("dashboard-1-charts").await;

    // A rate change from the page is what the admin API then reports.
    browser.fill("rate", "7.5").await;
    browser.click("#rate-apply").await;
    browser
        .wait_text(
            "status",
            "Admission rate set to 7.5",
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(admin_view(&stack, "ev").await["admission_rate_per_s"], 7.5);
    browser
        .wait_text("tile-rate-set", "7.5", Duration::from_secs(10))
        .await;

    // Pause and resume.
    browser.click("#pause").await;
    browser
        .wait_text("status", "Admission paused", Duration::from_secs(10))
        .await;
    assert_eq!(admin_view(&stack, "ev").await["paused"], true);
    browser
        .wait_text("tile-state", "paused", Duration::from_secs(10))
        .await;
    browser.screenshot("dashboard-2-paused").await;

    // The capacity planner: λ = 200/s, S = 50 ms, ρ = 0.5 → 20 workers.
    for (id, value) in [("lambda", "200"), ("service", "50"), ("rho", "0.5")] {
        browser.fill(id, value).await;
    }
    browser.click("#planner button").await;
    let plan = browser
        .wait_text("plan", "Workers at ρ", Duration::from_secs(10))
        .await;
    assert!(plan.contains("Workers at ρ\n20"), "{plan}");
    browser.screenshot("dashboard-3-planner").await;

    browser.stop().await;
    stack.stop().await;
}

#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn the_fan_page_counts_down_to_the_opening_and_says_sold_out(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start(pool_options, connect).await;
    // A sale that opens in an hour.
    let opens_at = chrono::Utc::now() + chrono::Duration::hours(1);
    let response = stack
        .http
        .put(format!("{}/admin/v1/events/later", stack.admission))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({
            "name": "Later", "capacity": 10, "opens_at": opens_at, "admission_rate_per_s": 10.0,
            "identity": "declared",
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    // A sale whose one seat is bought.
    stack.create_event("gone", 1, 50.0, 4).await;
    let (_, joined) = stack.join("gone", "lucky").await;
    let access = stack
        .wait_admitted("gone", joined["queue_ticket"].as_str().unwrap())
        .await;
    let (status, body) = stack.buy("gone", &access, 1, None).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");

    let browser = Browser::start().await;
    let page = &browser.client;
    page.goto(&format!("{}/?event=later", stack.gateway))
        .await
        .unwrap();
    let countdown = browser
        .wait_text("opens-in", "Opens in", Duration::from_secs(10))
        .await;
    assert!(
        countdown.contains("59 min") || countdown.contains("1 h 00 min"),
        "{countdown}"
    );
    // Keyboard only: every control is labelled, Tab from the fan id reaches
    // the join button and Enter presses it. Joining early is answered with
    // when the line opens, not an error.
    let unlabelled = page
        .execute(
            "return [...document.querySelectorAll('input, select, button')] \
               .filter(e => e.tagName === 'BUTTON' ? !e.textContent.trim() : e.labels.length === 0) \
               .map(e => e.id)",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(unlabelled, json!([]));
    page.find(Locator::Id("fan"))
        .await
        .unwrap()
        .send_keys(&Key::Tab)
        .await
        .unwrap();
    let focused = page.active_element().await.unwrap();
    assert_eq!(focused.attr("id").await.unwrap().as_deref(), Some("join"));
    focused.send_keys(&Key::Enter).await.unwrap();
    browser
        .wait_text("status", "The line opens in", Duration::from_secs(10))
        .await;
    browser.screenshot("fan-not-open").await;

    page.goto(&format!("{}/?event=gone", stack.gateway))
        .await
        .unwrap();
    browser
        .wait_text("status", "Sold out", Duration::from_secs(10))
        .await;
    let join = page.find(Locator::Id("join")).await.unwrap();
    assert_eq!(
        join.prop("disabled").await.unwrap().as_deref(),
        Some("true")
    );
    browser.screenshot("fan-sold-out").await;

    browser.stop().await;
    stack.stop().await;
}

/// An `anonymous` event on the fan page: no fan id to type, the proof of
/// work is bound to no id and spent once, and a reload keeps the fan's place
/// (the page rejoins with its queue ticket instead of making a new fan).
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn an_anonymous_fan_keeps_its_place_across_a_reload(
    pool_options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    let stack = Stack::start_with(pool_options, connect, false).await;
    stack
        .create_event_with(
            "anon",
            // Nobody is admitted: the fan stays in line.
            json!({
                "name": "Anonymous sale", "admission_rate_per_s": 0.001,
                "identity": "anonymous", "pow_bits": 8,
            }),
        )
        .await;
    let queue_length = || async {
        stack.public_event("anon").await["queue_length"]
            .as_u64()
            .unwrap()
    };

    let browser = Browser::start().await;
    for visit in 0..2 {
        browser
            .client
            .goto(&format!("{}/?event=anon", stack.gateway))
            .await
            .unwrap();
        browser
            .wait_text("name", "Anonymous sale", Duration::from_secs(10))
            .await;
        let hidden = browser
            .client
            .execute("return document.getElementById('fan-field').hidden", vec![])
            .await
            .unwrap();
        assert_eq!(hidden, true, "no fan id to type");
        browser.click("#join").await;
        browser
            .wait_text("status", "You are in line", Duration::from_secs(30))
            .await;
        browser.screenshot(&format!("anonymous-{visit}")).await;
        assert_eq!(
            queue_length().await,
            1,
            "visit {visit}: still one fan in line"
        );
    }
    browser.stop().await;
    stack.stop().await;
}

/// An `account` event: the ticketing site's login sends the fan to the page
/// with an identity token in the address; the page joins with it, and takes
/// it out of the address bar and the history at once, so that a shared link
/// or a screenshot does not hand the fan's login to someone else.
#[sqlx::test(migrator = "order_service::MIGRATOR")]
async fn an_account_fan_joins_with_the_token_in_the_address_and_the_page_removes_it(
    options: PgPoolOptions,
    connect: PgConnectOptions,
) {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

    let pem = boxoffice_contract::token::generate_ed25519_pem();
    let jwks =
        boxoffice_contract::token::KeySet::from_pems("login", &pem, &[], common::QUEUE_SECRET)
            .unwrap()
            .jwks();
    let jwks = serde_json::to_value(jwks).unwrap();
    let kid = jwks["keys"][0]["kid"].as_str().unwrap().to_owned();
    let jwks_file = std::env::temp_dir().join(format!("jwks-{}.json", uuid::Uuid::new_v4()));
    std::fs::write(&jwks_file, jwks.to_string()).unwrap();
    let path = jwks_file.display().to_string();
    let stack = Stack::start_with_gateway(options, connect, |c| {
        c.identity_jwks = Some(path);
        c.identity_issuer = "https://login.example.com".into();
        c.identity_audience = "boxoffice".into();
    })
    .await;
    stack
        .create_event_with(
            "acct",
            json!({ "name": "Members' sale", "identity": "account", "admission_rate_per_s": 0.001 }),
        )
        .await;
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(kid);
    let token = encode(
        &header,
        &json!({
            "sub": "user-42", "iss": "https://login.example.com", "aud": "boxoffice",
            "exp": boxoffice_contract::token::now_s() + 600,
        }),
        &EncodingKey::from_ed_pem(pem.as_bytes()).unwrap(),
    )
    .unwrap();

    let browser = Browser::start().await;
    let history_length = || async {
        browser
            .client
            .execute("return history.length", vec![])
            .await
            .unwrap()
            .as_u64()
            .unwrap()
    };
    let before = history_length().await;
    browser
        .client
        .goto(&format!(
            "{}/?event=acct#identity_token={token}",
            stack.gateway
        ))
        .await
        .unwrap();
    browser
        .wait_text("name", "Members' sale", Duration::from_secs(10))
        .await;
    let address = browser.client.current_url().await.unwrap().to_string();
    assert!(
        !address.contains(&token),
        "the token is still in the address: {address}"
    );
    assert!(address.ends_with("/?event=acct"), "{address}");
    assert_eq!(
        history_length().await,
        before + 1,
        "replaced, not pushed: no entry with the token behind it"
    );
    browser.click("#join").await;
    browser
        .wait_text("status", "You are in line", Duration::from_secs(30))
        .await;
    let mut redis = redis::Client::open(common::redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let queue = boxoffice_contract::keys::EventKeys::new(&stack.prefix, "acct").queue();
    let fans: Vec<String> = redis::cmd("ZRANGE")
        .arg(queue)
        .arg(0)
        .arg(-1)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(fans, ["user-42"], "the page joined as the token's subject");
    browser.stop().await;
    stack.stop().await;
    let _ = std::fs::remove_file(jwks_file);
}
