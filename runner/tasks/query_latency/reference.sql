-- The reference: the question the workload asks, written as plainly as SQL allows. Its rows, for
-- every parameter set, are what a query.sql must return, in this order.
--
-- For one region's customers and one product category, over a window of whole months
-- (:start inclusive, :end exclusive, ISO dates): the ten products that brought in the most
-- revenue from delivered orders, with the units sold and the number of distinct buyers.
SELECT
    p.id AS product_id,
    p.name AS product,
    SUM(oi.quantity) AS units,
    SUM(oi.quantity * oi.unit_price_cents) AS revenue_cents,
    COUNT(DISTINCT o.customer_id) AS buyers
FROM orders AS o
JOIN customers AS c ON c.id = o.customer_id
JOIN order_items AS oi ON oi.order_id = o.id
JOIN products AS p ON p.id = oi.product_id
WHERE c.region = :region
  AND p.category = :category
  AND o.status = 'delivered'
  AND o.ordered_at >= :start
  AND o.ordered_at < :end
GROUP BY p.id, p.name
ORDER BY revenue_cents DESC, p.id
LIMIT 10;
