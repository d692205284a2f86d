-- The ten products of a category that brought in the most revenue from one region's delivered
-- orders in a window of months, with units sold and distinct buyers.
-- Parameters: :region, :category, :start (inclusive), :end (exclusive), dates as 'YYYY-MM-DD'.
--
-- Shape of this file: CREATE INDEX (and ANALYZE) statements first, then exactly one query.
-- This first version is correct and slow: no index, every order line of three years looked at,
-- and three correlated subqueries for each of them.
WITH item_facts AS (
    SELECT
        oi.product_id,
        oi.quantity,
        oi.unit_price_cents,
        o.customer_id,
        o.ordered_at,
        o.status,
        (SELECT c.region FROM customers AS c WHERE c.id = o.customer_id) AS region,
        (SELECT p.category FROM products AS p WHERE p.id = oi.product_id) AS category
    FROM order_items AS oi
    JOIN orders AS o ON o.id = oi.order_id
)
SELECT
    product_id,
    (SELECT p.name FROM products AS p WHERE p.id = product_id) AS product,
    SUM(quantity) AS units,
    SUM(quantity * unit_price_cents) AS revenue_cents,
    COUNT(DISTINCT customer_id) AS buyers
FROM item_facts
WHERE region = :region
  AND category = :category
  AND status = 'delivered'
  AND ordered_at >= :start
  AND ordered_at < :end
GROUP BY product_id
ORDER BY revenue_cents DESC, product_id
LIMIT 10;
