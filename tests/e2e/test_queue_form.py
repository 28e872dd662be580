"""The new-queue form: each checkbox's label is its own, where it reads."""

import pytest
from playwright.sync_api import expect

from tests.e2e.conftest import at_both_widths, sign_in

pytestmark = [pytest.mark.slow, at_both_widths]


@pytest.fixture
def alice_page(context, page, live_server, alice, bob):
    sign_in(context, alice, live_server)
    page.goto("/p/acme/queues/new/")
    return page


def test_clicking_the_label_tool_error_ticks_the_tool_error_box(alice_page):
    page = alice_page
    page.get_by_text("Tool Error", exact=True).click()
    expect(page.locator("input[name=termination][value=tool_error]")).to_be_checked()
    assert page.locator("input[name=termination]:checked").count() == 1


# Where the text of a label is drawn (the label's box also holds its checkbox).
TEXT_BOX = """label => {
  const text = [...label.childNodes].find(node => node.nodeType === 3 && node.textContent.trim());
  const range = document.createRange();
  range.selectNodeContents(text);
  const box = range.getBoundingClientRect();
  return {x: box.x, y: box.y, width: box.width, height: box.height};
}"""


@pytest.mark.parametrize("value", ["completed", "timeout", "tool_error", "max_steps"])
def test_each_termination_label_reads_beside_its_own_box(alice_page, value):
    box = alice_page.locator(f"input[name=termination][value={value}]")
    label = alice_page.locator(f"label[for='{box.get_attribute('id')}']")
    box_at, text_at = box.bounding_box(), label.evaluate(TEXT_BOX)
    # On the box's row, just right of it: not under it, where it would read as the next box's.
    middle = box_at["y"] + box_at["height"] / 2
    assert text_at["y"] <= middle <= text_at["y"] + text_at["height"]
    assert box_at["x"] + box_at["width"] <= text_at["x"] <= box_at["x"] + box_at["width"] + 16


def test_clicking_a_reviewers_name_ticks_their_assignee_box(alice_page, bob):
    alice_page.locator("fieldset.choices").filter(has_text="Assignees").get_by_text(
        "bob", exact=True
    ).click()
    expect(alice_page.locator(f"input[name=assignees][value='{bob.pk}']")).to_be_checked()
