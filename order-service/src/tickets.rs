//! Tickets: a signed code per seat, a PDF per order (one A6 page a seat,
//! with the event name, the seat, and the code as a QR code), and the object
//! store the PDFs live in, named by a URL (`BOXOFFICE_TICKET_STORE`): a local
//! directory for the dev stack, an S3 bucket (AWS or any S3-compatible
//! server) when several replicas must see the same PDFs.

use std::sync::Arc;

use anyhow::{bail, Context};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as StorePath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use pdf_writer::{Content, Name, Pdf, Rect, Ref, Str};
use sha2::Sha256;
use url::Url;
use uuid::Uuid;

/// The setting a ticket store URL comes from, named in its errors.
const SETTING: &str = "BOXOFFICE_TICKET_STORE";

/// What a `BOXOFFICE_TICKET_STORE` value names, checked without touching
/// anything (so the command line can refuse a bad one before the service
/// connects anywhere).
#[derive(Debug, Clone, PartialEq)]
pub enum Location {
    /// A local directory: a plain path, or `file:///abs/dir`.
    Local(std::path::PathBuf),
    /// `s3://bucket/prefix` (or `s3a://`).
    S3 { url: String, prefix: StorePath },
    /// `memory://`, in this process only (unit tests).
    Memory { prefix: StorePath },
}

impl Location {
    pub fn parse(url: &str) -> anyhow::Result<Self> {
        if url.trim().is_empty() {
            bail!("{SETTING} is empty; give a directory or a URL such as `s3://bucket/prefix`");
        }
        let parsed = match Url::parse(url) {
            Ok(parsed) => parsed,
            Err(url::ParseError::RelativeUrlWithoutBase) => return Ok(Self::Local(url.into())),
            Err(error) => bail!("{SETTING} {url:?} is not a valid URL or path: {error}"),
        };
        let prefix = || {
            StorePath::from_url_path(parsed.path())
                .with_context(|| format!("{SETTING} {url:?}: the path is not a valid prefix"))
        };
        match parsed.scheme() {
            "file" => {
                if parsed
                    .host_str()
                    .is_some_and(|h| !h.is_empty() && h != "localhost")
                {
                    bail!(
                        "{SETTING} {url:?}: a file: URL names a local directory, \
                         `file:///abs/dir`, not a host"
                    );
                }
                let dir = parsed
                    .to_file_path()
                    .map_err(|()| anyhow::anyhow!("{SETTING} {url:?}: not a local directory"))?;
                Ok(Self::Local(dir))
            }
            "s3" | "s3a" => {
                if parsed.host_str().is_none_or(str::is_empty) {
                    bail!("{SETTING} {url:?}: an S3 URL needs a bucket, `s3://bucket/prefix`");
                }
                Ok(Self::S3 {
                    url: url.to_owned(),
                    prefix: prefix()?,
                })
            }
            "memory" => Ok(Self::Memory { prefix: prefix()? }),
            scheme => bail!(
                "{SETTING} {url:?}: unknown scheme {scheme:?}; use a directory, \
                 `file:///abs/dir`, `s3://bucket/prefix` or `memory://`"
            ),
        }
    }
}

/// `clap`'s check of `--ticket-store` / `BOXOFFICE_TICKET_STORE`: the value
/// unchanged if [`Location::parse`] takes it.
pub fn check_url(url: &str) -> Result<String, String> {
    Location::parse(url)
        .map(|_| url.to_owned())
        .map_err(|error| format!("{error:#}"))
}

/// Where ticket PDFs are kept: `orders/{order_id}.pdf` in an object store,
/// under the URL's path prefix.
#[derive(Clone)]
pub struct TicketStore {
    store: Arc<dyn ObjectStore>,
}

impl TicketStore {
    /// The store a `BOXOFFICE_TICKET_STORE` value names, with S3's endpoint,
    /// region and credentials from the standard `AWS_*` environment
    /// variables (`AWS_ENDPOINT_URL` or `AWS_ENDPOINT`, `AWS_REGION`,
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
    /// `AWS_ALLOW_HTTP`, …). See [`TicketStore::open`] for the forms.
    pub fn from_url(url: &str) -> anyhow::Result<Self> {
        Self::open(url, AmazonS3Builder::from_env())
    }

    /// The store `url` names, S3 settings from `s3` (the URL's bucket wins
    /// over one set there):
    ///
    /// - a plain path, absolute or relative (`.run/tickets`), or
    ///   `file:///abs/dir`: that local directory, created if missing;
    /// - `s3://bucket` or `s3://bucket/prefix` (also `s3a://`): objects are
    ///   `prefix/orders/{id}.pdf` in the bucket;
    /// - `memory://`: in this process only, gone at exit (unit tests).
    ///
    /// Anything else (another scheme, a `file:` URL with a host, `s3://`
    /// without a bucket) is an error naming `BOXOFFICE_TICKET_STORE`.
    /// Nothing remote is contacted here: a wrong endpoint or credentials
    /// show at the first put or get.
    pub fn open(url: &str, s3: AmazonS3Builder) -> anyhow::Result<Self> {
        let (store, prefix): (Arc<dyn ObjectStore>, StorePath) = match Location::parse(url)? {
            Location::Local(dir) => return Self::local(&dir.to_string_lossy()),
            Location::S3 { url, prefix } => {
                let store = s3
                    .with_url(&url)
                    .build()
                    .with_context(|| format!("{SETTING} {url:?}: the S3 store cannot be set up"))?;
                (Arc::new(store), prefix)
            }
            Location::Memory { prefix } => {
                (Arc::new(object_store::memory::InMemory::new()), prefix)
            }
        };
        Ok(Self::new(if prefix.as_ref().is_empty() {
            store
        } else {
            Arc::new(PrefixStore::new(store, prefix))
        }))
    }

    /// A local directory (created if missing).
    pub fn local(dir: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("{SETTING}: cannot create the directory {dir:?}"))?;
        Ok(Self {
            store: Arc::new(
                object_store::local::LocalFileSystem::new_with_prefix(dir)
                    .with_context(|| format!("{SETTING}: cannot use the directory {dir:?}"))?,
            ),
        })
    }

    /// Any object store (S3, GCS, Azure, memory).
    pub fn new(store: Arc<dyn ObjectStore>) -> Self {
        Self { store }
    }

    fn path(order_id: Uuid) -> StorePath {
        StorePath::from(format!("orders/{order_id}.pdf"))
    }

    pub async fn put(&self, order_id: Uuid, pdf: Vec<u8>) -> object_store::Result<()> {
        self.store
            .put(&Self::path(order_id), PutPayload::from(pdf))
            .await
            .map(drop)
    }

    /// The order's PDF, or `None` if it has not been issued.
    pub async fn get(&self, order_id: Uuid) -> object_store::Result<Option<Vec<u8>>> {
        match self.store.get(&Self::path(order_id)).await {
            Ok(found) => Ok(Some(found.bytes().await?.to_vec())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }
}

/// Signs ticket codes: `{order_id}.{seat}.{mac}`, where the MAC (HMAC-SHA256,
/// first 16 bytes, base64url) covers the event, order and seat. The gate
/// checks a scanned code with [`TicketSigner::verify`] and the same secret.
#[derive(Clone)]
pub struct TicketSigner {
    mac: Hmac<Sha256>,
}

impl TicketSigner {
    pub fn new(secret: &[u8]) -> Self {
        Self {
            mac: Hmac::new_from_slice(secret).expect("HMAC takes any key length"),
        }
    }

    fn tag(&self, event_id: &str, order_id: Uuid, seat: i32) -> String {
        let mut mac = self.mac.clone();
        mac.update(format!("{event_id}|{order_id}|{seat}").as_bytes());
        URL_SAFE_NO_PAD.encode(&mac.finalize().into_bytes()[..16])
    }

    /// The same inputs always give the same code, so a redelivered event
    /// writes the same tickets.
    pub fn code(&self, event_id: &str, order_id: Uuid, seat: i32) -> String {
        format!("{order_id}.{seat}.{}", self.tag(event_id, order_id, seat))
    }

    /// The order and seat of a genuine code for `event_id`.
    pub fn verify(&self, event_id: &str, code: &str) -> Option<(Uuid, i32)> {
        let mut parts = code.splitn(3, '.');
        let order_id: Uuid = parts.next()?.parse().ok()?;
        let seat: i32 = parts.next()?.parse().ok()?;
        let tag = URL_SAFE_NO_PAD.decode(parts.next()?).ok()?;
        let mut mac = self.mac.clone();
        mac.update(format!("{event_id}|{order_id}|{seat}").as_bytes());
        mac.verify_truncated_left(&tag).ok()?;
        (tag.len() == 16).then_some((order_id, seat))
    }
}

/// One seat's ticket, as printed.
pub struct Ticket<'a> {
    pub event_name: &'a str,
    pub seat: i32,
    pub code: &'a str,
}

/// PDF text strings in the standard fonts are Latin-1; anything else
/// becomes `?` rather than garbage.
fn latin1(text: &str) -> Vec<u8> {
    text.chars()
        .map(|c| u8::try_from(u32::from(c)).unwrap_or(b'?'))
        .collect()
}

/// A PDF with one A6 page per ticket.
pub fn render(order_id: Uuid, tickets: &[Ticket<'_>]) -> Vec<u8> {
    const WIDTH: f32 = 298.0; // A6, in points
    const HEIGHT: f32 = 420.0;
    let mut pdf = Pdf::new();
    let catalog = Ref::new(1);
    let tree = Ref::new(2);
    let font = Ref::new(3);
    let font_name = Name(b"F1");
    let mut next = 4;
    let mut pages = Vec::new();
    for ticket in tickets {
        let (page_id, content_id) = (Ref::new(next), Ref::new(next + 1));
        next += 2;
        pages.push(page_id);
        let mut page = pdf.page(page_id);
        page.media_box(Rect::new(0.0, 0.0, WIDTH, HEIGHT));
        page.parent(tree);
        page.contents(content_id);
        page.resources().fonts().pair(font_name, font);
        drop(page);

        let mut content = Content::new();
        let line = |content: &mut Content, size: f32, y: f32, text: &str| {
            content.begin_text();
            content.set_font(font_name, size);
            content.next_line(24.0, y);
            content.show(Str(&latin1(text)));
            content.end_text();
        };
        line(&mut content, 18.0, HEIGHT - 48.0, ticket.event_name);
        line(
            &mut content,
            28.0,
            HEIGHT - 92.0,
            &format!("Seat {}", ticket.seat),
        );
        line(
            &mut content,
            8.0,
            HEIGHT - 112.0,
            &format!("Order {order_id}"),
        );
        // The QR code of the signed code, 200 pt wide, black modules on white.
        if let Ok(qr) = qrcode::QrCode::new(ticket.code.as_bytes()) {
            let width = qr.width();
            let module = 200.0 / (width as f32 + 8.0);
            let (left, bottom) = (49.0 + 4.0 * module, 60.0 + 4.0 * module);
            content.set_fill_gray(0.0);
            for (i, color) in qr.to_colors().iter().enumerate() {
                if *color == qrcode::Color::Dark {
                    let (x, y) = ((i % width) as f32, (i / width) as f32);
                    content.rect(
                        left + x * module,
                        bottom + (width as f32 - 1.0 - y) * module,
                        module,
                        module,
                    );
                }
            }
            content.fill_nonzero();
        }
        line(&mut content, 6.0, 40.0, ticket.code);
        pdf.stream(content_id, &content.finish());
    }
    pdf.catalog(catalog).pages(tree);
    pdf.pages(tree)
        .kids(pages.iter().copied())
        .count(pages.len() as i32);
    pdf.type1_font(font).base_font(Name(b"Helvetica"));
    pdf.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_store_url_is_a_directory_an_s3_bucket_or_memory() {
        let local = |p: &str| Location::Local(p.into());
        assert_eq!(
            Location::parse(".run/tickets").unwrap(),
            local(".run/tickets")
        );
        assert_eq!(
            Location::parse("/var/tickets").unwrap(),
            local("/var/tickets")
        );
        assert_eq!(
            Location::parse("file:///var/tickets").unwrap(),
            local("/var/tickets")
        );
        assert_eq!(
            Location::parse("s3://bucket/some/prefix").unwrap(),
            Location::S3 {
                url: "s3://bucket/some/prefix".into(),
                prefix: StorePath::from("some/prefix"),
            }
        );
        assert_eq!(
            Location::parse("s3://bucket").unwrap(),
            Location::S3 {
                url: "s3://bucket".into(),
                prefix: StorePath::default(),
            }
        );
        assert_eq!(
            Location::parse("memory://").unwrap(),
            Location::Memory {
                prefix: StorePath::default()
            }
        );
    }

    #[test]
    fn a_bad_ticket_store_url_is_refused_naming_the_setting() {
        for bad in [
            "ftp://host/tickets",
            "gs://bucket/prefix",
            "https://example.com/tickets",
            "s3://",
            "s3:///prefix",
            "file://otherhost/tickets",
            "http://[::1",
            "",
        ] {
            let error = match TicketStore::open(bad, AmazonS3Builder::new()) {
                Ok(_) => panic!("{bad:?} was taken"),
                Err(error) => format!("{error:#}"),
            };
            assert!(error.contains("BOXOFFICE_TICKET_STORE"), "{bad:?}: {error}");
            assert_eq!(check_url(bad), Err(error));
        }
        assert!(format!("{:#}", Location::parse("ftp://h/t").unwrap_err())
            .contains("unknown scheme \"ftp\""));
        assert_eq!(check_url("s3://b/p"), Ok("s3://b/p".to_owned()));
    }

    #[tokio::test]
    async fn the_same_url_reads_back_what_was_put() {
        let dir = std::env::temp_dir().join(format!("boxoffice-tickets-{}", Uuid::now_v7()));
        let order = Uuid::now_v7();
        for url in [
            dir.join("plain").to_string_lossy().into_owned(),
            format!("file://{}", dir.join("url").display()),
        ] {
            let writer = TicketStore::open(&url, AmazonS3Builder::new()).unwrap();
            writer.put(order, b"%PDF-1.7 x".to_vec()).await.unwrap();
            let reader = TicketStore::open(&url, AmazonS3Builder::new()).unwrap();
            assert_eq!(reader.get(order).await.unwrap().unwrap(), b"%PDF-1.7 x");
            assert_eq!(reader.get(Uuid::now_v7()).await.unwrap(), None);
        }
        assert!(dir.join(format!("plain/orders/{order}.pdf")).is_file());
        assert!(dir.join(format!("url/orders/{order}.pdf")).is_file());
        std::fs::remove_dir_all(&dir).unwrap();

        let memory = TicketStore::open("memory:///some/prefix", AmazonS3Builder::new()).unwrap();
        memory.put(order, b"pdf".to_vec()).await.unwrap();
        assert_eq!(memory.get(order).await.unwrap().unwrap(), b"pdf");
        assert_eq!(memory.get(Uuid::now_v7()).await.unwrap(), None);
    }

    #[test]
    fn codes_verify_only_for_their_event_order_and_seat() {
        let signer = TicketSigner::new(b"secret");
        let order = Uuid::now_v7();
        let code = signer.code("ev", order, 7);
        assert_eq!(signer.verify("ev", &code), Some((order, 7)));
        assert_eq!(signer.code("ev", order, 7), code, "deterministic");
        assert_eq!(signer.verify("other", &code), None);
        let forged = code.replacen(".7.", ".8.", 1);
        assert_eq!(signer.verify("ev", &forged), None);
        assert_eq!(TicketSigner::new(b"other").verify("ev", &code), None);
        assert_eq!(signer.verify("ev", "garbage"), None);
    }

    #[test]
    fn a_pdf_has_one_page_per_ticket_with_its_seat_and_code() {
        let signer = TicketSigner::new(b"secret");
        let order = Uuid::now_v7();
        let codes: Vec<String> = (1..=3).map(|s| signer.code("ev", order, s)).collect();
        let tickets: Vec<Ticket<'_>> = codes
            .iter()
            .zip(1..)
            .map(|(code, seat)| Ticket {
                event_name: "The Show",
                seat,
                code,
            })
            .collect();
        let pdf = render(order, &tickets);
        let text = String::from_utf8_lossy(&pdf);
        assert!(text.starts_with("%PDF-"));
        let pages = text.matches("/Type /Page").count() - text.matches("/Type /Pages").count();
        assert_eq!(pages, 3);
        for (code, seat) in codes.iter().zip(1..) {
            assert!(text.contains(&format!("(Seat {seat})")));
            assert!(text.contains(code.as_str()));
        }
        assert!(text.contains("(The Show)"));
        // Dark QR modules are drawn as filled rectangles.
        assert!(text.matches(" re\n").count() > 100);
    }
}
