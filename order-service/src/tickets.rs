//! Tickets: a signed code per seat, a PDF per order (one A6 page a seat,
//! with the event name, the seat, and the code as a QR code), and the object
//! store the PDFs live in (a local directory here, S3 and the like in
//! production through the same `object_store` interface).

use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use pdf_writer::{Content, Name, Pdf, Rect, Ref, Str};
use sha2::Sha256;
use uuid::Uuid;

/// Where ticket PDFs are kept: `orders/{order_id}.pdf` in an object store.
#[derive(Clone)]
pub struct TicketStore {
    store: Arc<dyn ObjectStore>,
}

impl TicketStore {
    /// A local directory (created if missing).
    pub fn local(dir: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            store: Arc::new(object_store::local::LocalFileSystem::new_with_prefix(dir)?),
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
