-- the reference's join, with the indexes its plan wants
CREATE INDEX orders_by_day ON orders (ordered_at, status, customer_id);
CREATE INDEX items_by_order ON order_items (order_id, product_id, quantity, unit_price_cents);
CREATE INDEX customers_by_region ON customers (region);
ANALYZE;
SELECT p.id, p.name, SUM(oi.quantity), SUM(oi.quantity * oi.unit_price_cents) AS revenue_cents,
       COUNT(DISTINCT o.customer_id)
FROM orders AS o
JOIN customers AS c ON c.id = o.customer_id
JOIN order_items AS oi ON oi.order_id = o.id
JOIN products AS p ON p.id = oi.product_id
WHERE c.region = :region AND p.category = :category AND o.status = 'delivered'
  AND o.ordered_at >= :start AND o.ordered_at < :end
GROUP BY p.id
ORDER BY revenue_cents DESC, p.id
LIMIT 10;
